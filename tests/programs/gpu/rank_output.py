"""How the multi-rank GPU test programs print: each line in one write. The ranks share the launcher's stdout,
and a line written in two parts (print writes the text and its newline apart) can be cut by another rank's."""
import sys


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
