"""The Python package (python/vmmckpt) checked end to end on the emulated driver, with the real shim and the
real cuda-ckpt. One check per invocation:

  api_check.py pause keep|discard   pause_program.py pauses itself; in between ps shows it paused with no
                                    memory reserved and dump is refused; it resumes and checks its bytes
  api_check.py tool                 ps, dump, inspect, verify, suspend, resume, restore and their exceptions
  api_check.py peek                 peek_program.py names its memory, peeks it by name and address, pokes it
  api_check.py tags                 tags_program.py tags its memory with region() and sleeps at levels 1 and 2
  api_check.py no_shim              pause() outside the shim raises NotUnderShimError
  api_check.py types                arguments of the wrong type raise TypeError before anything runs

Environment: VMMCKPT_CUDA_CKPT (the tool; default: the installed package's), VMMCKPT_TEST_PROGRAMS (the test programs' directory), PYTHONPATH
with python/, LD_LIBRARY_PATH with the emulated libcuda.so.1.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import vmmckpt

HERE = Path(__file__).resolve().parent
TOOL = vmmckpt.tool_path()  # $VMMCKPT_CUDA_CKPT, else the installed package's own


def fail(why):
    sys.exit(f"FAIL: {why}")


def wait_for(path, seconds=60, proc=None):
    deadline = time.monotonic() + seconds
    while not Path(path).exists():
        if proc is not None and proc.poll() is not None:
            fail(f"the program ended ({proc.returncode}) before writing {path}")
        if time.monotonic() > deadline:
            fail(f"{path} did not appear")
        time.sleep(0.05)


def check_pause(mode, work):
    state = work / "state"
    prog = subprocess.Popen([TOOL, "run", "--", sys.executable, str(HERE / "pause_program.py"), mode, "8", str(state)])
    try:
        wait_for(state, proc=prog)
        pid = prog.pid
        [me] = vmmckpt.ps(pid) or [None]
        if me is None:
            fail(f"ps does not list {pid}")
        if me.state != "paused" or me.reserved_bytes != 0 or me.live_bytes < 3 * 8 << 20:
            fail(f"ps says {me}")
        try:
            vmmckpt.dump(pid, work / "img")
            fail("dump of a paused process succeeded")
        except vmmckpt.CommandFailedError as e:
            if "paused its own GPU memory" not in e.message:
                fail(f"dump refused for another reason: {e.message}")
        if (work / "img").exists():
            fail("the refused dump left an image")
        try:
            vmmckpt.resume(pid)
            fail("cuda-ckpt resume of a paused process succeeded")
        except vmmckpt.CommandFailedError as e:
            if "resumes it itself" not in e.message:
                fail(f"resume refused for another reason: {e.message}")
        (work / "state.go").touch()
        if prog.wait(timeout=120) != 0:
            fail(f"the program failed ({prog.returncode})")
    finally:
        if prog.poll() is None:
            prog.kill()


def check_tool(work):
    programs = Path(os.environ["VMMCKPT_TEST_PROGRAMS"])
    writer = subprocess.Popen([TOOL, "run", "--", str(programs / "emu_busy_writer"), "--buffers", "4", "--size", str(4 << 20),
                               "--seconds", "300"],
                              stdout=subprocess.PIPE, text=True)
    try:
        for line in writer.stdout:
            if "ready" in line:
                break
        else:
            fail("emu_busy_writer did not start")
        pid = writer.pid
        listed = vmmckpt.ps(pid)
        if len(listed) != 1 or listed[0].state != "running" or listed[0].live_bytes < 16 << 20:
            fail(f"ps({pid}) = {listed}")
        d = vmmckpt.dump(pid, work / "image")
        if d.pid != pid or d.bytes < 16 << 20 or Path(d.image) != work / "image" or d.partial:
            fail(f"dump = {d}")
        info = vmmckpt.inspect(d.image)
        if info.data_bytes != d.bytes or info.allocation_count < 1 or info.format < 4:
            fail(f"inspect = {info}")
        v = vmmckpt.verify(d.image)
        if v.partial:
            fail(f"verify = {v}")
        s = vmmckpt.suspend(pid, work / "suspended")
        if s.freed_bytes < 16 << 20 or vmmckpt.ps(pid)[0].state != "suspended":
            fail(f"suspend = {s}")
        r = vmmckpt.resume(pid)
        # resume loads every byte back, the zero blocks' too (suspend wrote only the others)
        if r.bytes != s.bytes + s.zero_bytes or vmmckpt.ps(pid)[0].state != "running":
            fail(f"resume = {r}")
    finally:
        writer.kill()
        writer.wait()

    # Failures come as typed exceptions that carry cuda-ckpt's message.
    try:
        vmmckpt.dump(pid, work / "gone")
        fail("dump of an ended process succeeded")
    except vmmckpt.NoSuchProcessError as e:  # a CommandFailedError, typed by its cause
        if e.exit_code != 1 or str(pid) not in e.message:
            fail(f"dump of an ended process: {e.exit_code} {e.message}")
    # A process not started under the shim: its own class, and the way on.
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        vmmckpt.dump(plain.pid, work / "plain")
        fail("dump of a process without the shim succeeded")
    except vmmckpt.NotUnderVmmckptError as e:
        if "cuda-ckpt run" not in e.message or "cuda-checkpoint --toggle" not in e.message:
            fail(f"dump of a process without the shim: {e.message}")
    finally:
        plain.kill()
        plain.wait()
    try:
        vmmckpt.dump(-5)
        fail("dump -5 succeeded")
    except (vmmckpt.UsageError, vmmckpt.CommandFailedError):
        pass
    damaged = work / "damaged"
    shutil.copytree(d.image, damaged)
    data = sorted(p for p in damaged.iterdir() if p.name != "manifest.json" and p.stat().st_size > 4096)[0]
    with open(data, "r+b") as f:
        f.seek(data.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    try:
        vmmckpt.verify(damaged)
        fail("verify of a damaged image succeeded")
    except vmmckpt.ImageDefectError as e:
        if not e.defect:
            fail("ImageDefectError without the defect")
    try:
        vmmckpt.verify(work / "no-such-image")
        fail("verify of a missing image succeeded")
    except FileNotFoundError:
        pass
    except vmmckpt.ImageDefectError:
        fail("verify of a missing path raised ImageDefectError, as if an image were damaged")
    try:
        vmmckpt.inspect(work / "no-such-image")
        fail("inspect of a missing image succeeded")
    except vmmckpt.ImageError:
        pass

    # restore: the image's bytes back at their addresses in a new process, checked by the program itself.
    check = programs / "emu_restored_bytes_check"
    if check.exists():
        proc = vmmckpt.restore(d.image, [str(check), d.image])
        if proc.wait(timeout=120) != 0:
            fail(f"the restored program failed ({proc.returncode})")
    restored = vmmckpt.restore(damaged, ["true"], stderr=subprocess.PIPE, text=True)
    if restored.wait(timeout=60) != 1 or "checksum" not in restored.stderr.read().lower():
        fail("restore of a damaged image did not fail before the command")


def check_no_shim():
    if vmmckpt.under_shim():
        fail("under_shim() is true without the shim")
    try:
        vmmckpt.pause()
        fail("pause() without the shim succeeded")
    except vmmckpt.NotUnderShimError as e:
        if "cuda-ckpt run" not in e.message:
            fail(f"the message does not say what to do: {e.message}")


def check_types():
    """Arguments of the wrong type raise TypeError before anything runs, never coerced."""
    def refused(call, what):
        try:
            call()
        except TypeError as e:
            return str(e)
        fail(f"{what} was accepted")

    for wrong in (None, "no", 0, 1, "True"):
        message = refused(lambda: vmmckpt.pause(keep=wrong), f"pause(keep={wrong!r})")
        if "keep must be a bool" not in message:
            fail(f"pause(keep={wrong!r}): {message}")
        refused(lambda: vmmckpt.paused(keep=wrong).__enter__(), f"paused(keep={wrong!r})")
    refused(lambda: vmmckpt.dump("123"), 'dump("123")')
    refused(lambda: vmmckpt.dump(12.7), "dump(12.7)")
    refused(lambda: vmmckpt.dump(True), "dump(True)")
    refused(lambda: vmmckpt.dump(1, allow_partial="no"), 'dump(allow_partial="no")')
    refused(lambda: vmmckpt.dump(1, deadline="5"), 'dump(deadline="5")')
    refused(lambda: vmmckpt.suspend(1, verify=None), "suspend(verify=None)")
    refused(lambda: vmmckpt.resume("1"), 'resume("1")')
    refused(lambda: vmmckpt.ps("1"), 'ps("1")')
    refused(lambda: vmmckpt.inspect(3), "inspect(3)")
    refused(lambda: vmmckpt.verify(None), "verify(None)")
    refused(lambda: vmmckpt.restore("img", "python train.py"), "restore(command=str)")
    refused(lambda: vmmckpt.restore("img", ["x"], replay=1), "restore(replay=1)")


def main():
    with tempfile.TemporaryDirectory(prefix="vmmckpt-python-") as tmp:
        work = Path(tmp)
        what = sys.argv[1]
        if what == "pause":
            check_pause(sys.argv[2], work)
        elif what == "tool":
            check_tool(work)
        elif what == "peek":
            done = subprocess.run([TOOL, "run", "--", sys.executable, str(HERE / "peek_program.py")], timeout=120)
            if done.returncode != 0:
                fail(f"peek_program.py exited {done.returncode}")
        elif what == "tags":
            done = subprocess.run([TOOL, "run", "--", sys.executable, str(HERE / "tags_program.py")], timeout=120)
            if done.returncode != 0:
                fail(f"tags_program.py exited {done.returncode}")
        elif what == "no_shim":
            check_no_shim()
        elif what == "types":
            check_types()
        else:
            sys.exit(f"unknown check {what}")
    print(f"ok: {' '.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()
