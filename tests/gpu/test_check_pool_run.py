#!/usr/bin/env python3
"""Self-test of check_pool_run.py without a GPU: size parsing, pool ranges, line parsing, and whole
runs against a fake program that prints pool or non-pool pointers depending on LD_PRELOAD."""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_pool_run as cpr  # noqa: E402

GiB = 1 << 30

FAKE_PROGRAM = textwrap.dedent("""\
    import os, sys
    mode = sys.argv[1]
    shim = bool(os.environ.get("LD_PRELOAD"))
    base = int(os.environ.get("VMMCKPT_POOL_BASE", "0x200000000000"), 0)
    if mode == "skip":
        print("SKIP: nothing here", file=sys.stderr)
        sys.exit(77)
    if mode == "crash" and shim:
        print("boom", file=sys.stderr)
        sys.exit(3)
    if shim and mode != "outside":
        addrs = [base + 0x200000, base + 0x400000]
    elif mode == "native_in_pool":
        addrs = [base + 0x1000, base + 0x2000]
    else:
        addrs = [0x7f0000000000, 0x7f0000200000]
    for a in addrs:
        print(f"ptr 0x{a:x} 4096 cudaMalloc")
    print("info free text that is never compared")
    value = "0x2" if (mode == "differ" and shim) else "0x1"
    print(f"result checksum {value}")
    print("case cudaFree_null cudaSuccess(0)")
    print(f"case pitch_value {'512' if shim else '1024'}")
    """)


class PureLogic(unittest.TestCase):
    def test_parse_size(self):
        self.assertEqual(cpr.parse_size("0x200000000000"), 0x200000000000)
        self.assertEqual(cpr.parse_size("512G"), 512 * GiB)
        self.assertEqual(cpr.parse_size("1T"), 1 << 40)
        self.assertEqual(cpr.parse_size("64m"), 64 << 20)
        self.assertEqual(cpr.parse_size("4096"), 4096)
        self.assertEqual(cpr.parse_size("0x10K"), 16 << 10)
        for bad in ("", "G", "12Q", "0xZZ", "-5"):
            with self.assertRaises(ValueError):
                cpr.parse_size(bad)

    def test_pool_layout(self):
        self.assertEqual(cpr.pool_layout({}), (0x200000000000, 0x8000000000))
        env = {"VMMCKPT_POOL_BASE": "0x400000000000", "VMMCKPT_POOL_SIZE": "64G"}
        self.assertEqual(cpr.pool_layout(env), (0x400000000000, 64 * GiB))

    def test_pool_index(self):
        base, size = 0x200000000000, 0x8000000000
        self.assertEqual(cpr.pool_index(base, 1, base, size, 1), 0)
        self.assertEqual(cpr.pool_index(base + size - 1, 1, base, size, 1), 0)
        self.assertIsNone(cpr.pool_index(base + size - 1, 2, base, size, 1))  # runs off the end
        self.assertIsNone(cpr.pool_index(base + size, 1, base, size, 1))      # device 1, only 1
        self.assertEqual(cpr.pool_index(base + size, 1, base, size, 2), 1)
        self.assertIsNone(cpr.pool_index(base - 1, 1, base, size, 1))
        self.assertEqual(cpr.pool_index(base + 100, 0, base, size, 1), 0)    # size 0: address only
        # Straddling two device pools is not inside either.
        self.assertIsNone(cpr.pool_index(base + size - 10, 20, base, size, 2))

    def test_overlaps(self):
        base, size = 0x200000000000, 0x8000000000
        self.assertTrue(cpr.overlaps_pools(base - 10, 20, base, size, 1))
        self.assertFalse(cpr.overlaps_pools(base - 10, 10, base, size, 1))
        self.assertFalse(cpr.overlaps_pools(base + size, 10, base, size, 1))

    def test_parse_output(self):
        out = cpr.parse_output("ptr 0x200000000000 1024 cudaMalloc\n"
                               "ptr zz 1 x\n"
                               "result a 0x1\nresult b\ncase c cudaSuccess(0) k=1\n"
                               "info pitch 512\nnoise\n\n", info_patterns=["a"])
        self.assertEqual(out.ptrs, [(0x200000000000, 1024, "cudaMalloc", 1)])
        self.assertEqual(len(out.errors), 2)  # bad ptr, result without value
        self.assertEqual([r[:3] for r in out.records], [("case", "c", "cudaSuccess(0) k=1")])

    def test_compare_records(self):
        nat = [("result", "x", "1", 1), ("case", "y", "A", 2), ("result", "only_native", "1", 3)]
        shm = [("result", "x", "2", 1), ("case", "y", "A", 2), ("result", "only_shim", "1", 3)]
        problems = cpr.compare_records(nat, shm)
        self.assertEqual(len(problems), 3, problems)
        self.assertIn("result x differs", problems[0])


    def test_compare_ptr_shapes(self):
        def out(*ptrs):
            o = cpr.Output()
            o.ptrs = [(0x1000 * i, size, api, i) for i, (size, api) in enumerate(ptrs)]
            return o
        self.assertEqual(cpr.compare_ptr_shapes(out((1, "a"), (2048, "cudaMallocPitch")),
                                                out((1, "a"), (4096, "cudaMallocPitch"))), [])
        self.assertEqual(len(cpr.compare_ptr_shapes(out((1, "a")), out((2, "a")))), 1)
        self.assertEqual(len(cpr.compare_ptr_shapes(out((1, "a")), out((1, "a"), (1, "a")))), 1)


class WholeRuns(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.prog = os.path.join(cls.tmp.name, "fake_prog.py")
        with open(cls.prog, "w") as f:
            f.write(FAKE_PROGRAM)
        # Any readable file will do: the fake program only looks at LD_PRELOAD being set, and
        # ld.so just warns about a preload that is not an ELF object.
        cls.shim = os.path.join(cls.tmp.name, "libfake.so")
        open(cls.shim, "w").close()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_harness(self, mode, *extra):
        cmd = [sys.executable, os.path.join(HERE, "check_pool_run.py"), "--shim", self.shim,
               "--no-gpu-check", "--info", "pitch_*", *extra, "--", sys.executable, self.prog, mode]
        env = {k: v for k, v in os.environ.items() if not k.startswith("VMMCKPT_POOL_")}
        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
        return res.returncode, res.stdout + res.stderr

    def test_pass(self):
        rc, out = self.run_harness("good", "--compare-native", "--check-deterministic")
        self.assertEqual(rc, 0, out)
        self.assertIn("PASS fake_prog.py: ptrs=2 in_pool=2 results=1 cases=1", out)

    def test_pool_env_override(self):
        rc, out = self.run_harness("good", "--compare-native",
                                   "--env", "VMMCKPT_POOL_BASE=0x400000000000")
        self.assertEqual(rc, 0, out)

    def test_outside_pool(self):
        rc, out = self.run_harness("outside")
        self.assertEqual(rc, 1, out)
        self.assertIn("is not inside a device pool", out)

    def test_results_differ(self):
        rc, out = self.run_harness("differ", "--compare-native")
        self.assertEqual(rc, 1, out)
        self.assertIn("result checksum differs: native '0x1' vs shim '0x2'", out)

    def test_native_in_pool(self):
        rc, out = self.run_harness("native_in_pool", "--compare-native")
        self.assertEqual(rc, 1, out)
        self.assertIn("lies in the pool range without the shim", out)

    def test_crash(self):
        rc, out = self.run_harness("crash", "--compare-native")
        self.assertEqual(rc, 1, out)
        self.assertIn("shim run exited 3", out)
        self.assertIn("boom", out)

    def test_skip(self):
        rc, out = self.run_harness("skip", "--compare-native")
        self.assertEqual(rc, 77, out)
        self.assertIn("SKIP fake_prog.py", out)


if __name__ == "__main__":
    unittest.main(verbosity=1)
