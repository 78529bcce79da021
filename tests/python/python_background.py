"""stabmeter.torch.Monitor(background=True), measuring on a thread of its own while the training
goes on: its traces and metrics are the same bits as a synchronous monitor's of the same training
(every step, every third, a step without before_step, a model off the CPU's path), its linear
layers' sigma within their reported error of numpy's float64 SVD; an error of the background
measurement is raised by the next call (wait, before_step, close), naming the step; a parameter
written in place between after_step and the next call raises StateError there and leaves that
step's row out of the trace; a step that is not after the trace's last is refused at after_step
itself; a child forked while a step is measured neither waits for it nor hangs. Where the process
may raise a thread back from SCHED_IDLE (root here), the measurement runs at SCHED_IDLE until the
training waits for it, then at the priority its thread had."""

import os
import tempfile
import threading
import unittest

import h5py
import numpy as np
import torch

import stabmeter
import stabmeter.torch as st
from stabmeter._lib import lib
from python_gpt import GPT, batches
from python_util import in_forked_child

WIDTH, DEPTH, HEADS, CONTEXT = 32, 2, 4, 16


def model_and_data(seed=0):
    torch.manual_seed(seed)
    model = GPT(vocab=64, width=WIDTH, depth=DEPTH, heads=HEADS, context=CONTEXT)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2), batches(64, CONTEXT, 4)


def train_step(model, opt, data, mon, step):
    """One step of the ordinary loop, monitored: after_step's answer."""
    x, y = next(data)
    loss = model(x, y)
    opt.zero_grad()
    loss.backward()
    mon.before_step(step)
    opt.step()
    return mon.after_step(step, loss=loss.item())


def datasets(path):
    """{dataset path: values} of a trace, wall_time left out (seconds differ)."""
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and not name.endswith("wall_time"):
                out[name] = obj[()]
        f.visititems(visit)
    return out


def same_bits(a, b):
    """Numbers: the same bits (NaN included); text: the same strings."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "O" or b.dtype.kind == "O":
        return a.shape == b.shape and a.tolist() == b.tolist()
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


class SameBits(unittest.TestCase):
    """A synchronous and a background monitor of one training, called side by side."""

    def train(self, steps, every=1, skip_before=(), after=None, **kw):
        d = tempfile.mkdtemp()
        model, opt, data = model_and_data()
        paths = [os.path.join(d, "sync.h5"), os.path.join(d, "bg.h5")]
        mons = [st.Monitor(model, trace=paths[0], heads=HEADS, every=every, **kw),
                st.Monitor(model, trace=paths[1], heads=HEADS, every=every, background=True,
                           priority="idle" if st.idle_priority()[0] else "normal", **kw)]
        started = []
        for step in range(1, steps + 1):
            x, y = next(data)
            loss = model(x, y)
            opt.zero_grad()
            loss.backward()
            if step not in skip_before:
                for m in mons:
                    m.before_step(step)
            opt.step()
            measured = [m.after_step(step, loss=loss.item(), lr=1e-2) for m in mons]
            self.assertEqual(measured[0], measured[1])
            started.append(mons[1]._pending is not None and measured[1])
            if after:
                after(step, mons, model)
        out = [(m.metrics(), m.reference(), m.steps) for m in mons]
        for m in mons:
            m.close()
        return out, [datasets(p) for p in paths], started, model

    def assert_same(self, result):
        (sync, bg), (ds, db), _, _ = result
        self.assertEqual(sync[2], bg[2])
        self.assertEqual(sorted(ds), sorted(db))
        for name in ds:
            self.assertTrue(same_bits(ds[name], db[name]), name)
        for name, m in sync[0].items():
            for key, v in m.items():
                self.assertTrue(same_bits(v, bg[0][name][key]), (name, key, v, bg[0][name][key]))
            for key, v in sync[1][name].items():
                self.assertTrue(same_bits(v, bg[1][name][key]), (name, key))

    def test_every_step(self):
        threads = []
        snapshot, measure_idle = lib.stab_monitor_snapshot, lib.stab_monitor_measure_idle

        def counted(m):
            threads.append(threading.current_thread() is threading.main_thread())
            return snapshot(m)

        def counted_idle(m, ticket, measure, with_update, take_snapshot):  # its snapshot is in C
            if take_snapshot:
                threads.append(threading.current_thread() is threading.main_thread())
            return measure_idle(m, ticket, measure, with_update, take_snapshot)
        lib.stab_monitor_snapshot, lib.stab_monitor_measure_idle = counted, counted_idle
        try:
            r = self.train(12)
        finally:
            lib.stab_monitor_snapshot, lib.stab_monitor_measure_idle = snapshot, measure_idle
        self.assert_same(r)
        self.assertTrue(all(r[2]), "each measured step was measured in the background")
        self.assertEqual(len(r[1][1]["step"]), 12)
        self.assertTrue(np.isfinite(r[1][1]["layers/rel_update"]).any(axis=1).all())
        # the synchronous monitor's 12 snapshots in before_step; the background one's first
        # there, the next 11 on its thread after each measurement (the 12th for a step not run)
        self.assertEqual(threads.count(True), 13)
        self.assertEqual(threads.count(False), 12)

    def test_written_between_steps(self):
        # a parameter written in place once the measurement is waited for: allowed, and the
        # snapshot the monitor's thread took before it is not used
        def scale(step, mons, model):
            for m in mons:
                m.wait()
            if step % 2:
                with torch.no_grad():
                    model.transformer.h[0].attn.c_proj.weight.mul_(1.5)
        self.assert_same(self.train(6, after=scale))

    def test_every_third_step(self):
        r = self.train(13, every=3)
        self.assert_same(r)
        self.assertEqual(list(r[1][1]["step"]), [3, 6, 9, 12])

    def test_without_before_step(self):
        # no before_step at all: each step measured at once, without update metrics, in both
        # modes (nothing says when the weights are written next)
        with self.assertWarns(RuntimeWarning):
            r = self.train(4, skip_before=range(1, 5))
        self.assert_same(r)
        self.assertEqual(r[2], [False] * 4)
        self.assertTrue(np.isnan(r[1][1]["layers/update"]).all())

    def test_off_the_cpu_path(self):
        # linear layers measured by stabmeter._device, the others from host copies
        self.assert_same(self.train(6, _on_device=True))

    def test_sigma_against_numpy(self):
        (_, (bg, _, _)), _, _, model = self.train(5)
        params = dict(model.named_parameters())
        checked = 0
        for name, m in bg.items():
            if m["kind"] != "linear" or name + ".weight" not in params:
                continue
            exact = float(np.linalg.svd(params[name + ".weight"].detach().double().numpy(), compute_uv=False)[0])
            self.assertLessEqual(m["sigma"], exact * (1 + 1e-12), name)
            self.assertLessEqual(exact - m["sigma"], m["sigma_rel_err"] * exact + 1e-12, name)
            checked += 1
        self.assertGreaterEqual(checked, 2 * DEPTH)


class Errors(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "t.h5")
        self.model, self.opt, self.data = model_and_data()
        self.mon = st.Monitor(self.model, trace=self.path, heads=HEADS, background=True)

    def tearDown(self):
        try:
            self.mon.close()
        except stabmeter.Error:
            pass
        self.dir.cleanup()

    def step(self, step, between=None):
        x, y = next(self.data)
        loss = self.model(x, y)
        self.opt.zero_grad()
        loss.backward()
        self.mon.before_step(step)
        if between:
            between()
        self.opt.step()
        return self.mon.after_step(step, loss=loss.item())

    def use_up_snapshot(self):
        # the C monitor's own check, made to fail on the monitor's thread: the snapshot
        # before_step took is used up here, so the background measurement has none
        self.assertEqual(lib.stab_monitor_measure(self.mon._m, 1), 0)

    def test_error_raised_by_the_next_call(self):
        self.assertTrue(self.step(1))
        self.assertTrue(self.step(2, between=self.use_up_snapshot))
        with self.assertRaises(stabmeter.StateError) as e:
            self.mon.wait()
        self.assertIn("after_step(2), measured in the background", str(e.exception))
        self.assertIn("no snapshot since the last measurement", str(e.exception))
        self.mon.wait()  # raised once
        self.assertTrue(self.step(3))
        self.mon.close()
        self.assertEqual(list(datasets(self.path)["step"]), [1, 3])

    def test_error_raised_by_before_step(self):
        self.step(1, between=self.use_up_snapshot)
        with self.assertRaises(stabmeter.StateError):
            self.mon.before_step(2)

    def test_error_raised_by_close(self):
        self.step(1)
        self.step(2, between=self.use_up_snapshot)
        with self.assertRaises(stabmeter.StateError) as e:
            self.mon.close()
        self.assertIn("after_step(2)", str(e.exception))
        self.assertFalse(self.mon._m)  # closed all the same
        self.assertEqual(list(datasets(self.path)["step"]), [1])

    def test_parameter_written_meanwhile(self):
        self.step(1)
        self.step(2)
        with torch.no_grad():
            self.model.transformer.h[1].mlp.c_fc.weight.mul_(0.5)
        with self.assertRaises(stabmeter.StateError) as e:
            self.mon.before_step(3)
        self.assertIn("transformer.h.1.mlp.c_fc.weight was written in place after after_step(2)", str(e.exception))
        self.mon.close()
        self.assertEqual(list(datasets(self.path)["step"]), [1])

    def test_optimizer_step_without_before_step(self):
        self.step(1)
        # a loop that skips before_step at step 2: the optimizer writes while step 1 may be read
        x, y = next(self.data)
        self.model(x, y).backward()
        self.opt.step()
        with self.assertRaises(stabmeter.StateError):
            self.mon.after_step(2)

    def test_step_not_after_the_last_refused_at_the_call(self):
        self.step(4)
        self.mon.wait()
        with self.assertRaises(stabmeter.RangeError) as e:
            self.step(4)
        self.assertIn("step 4 is not after the last step 4", str(e.exception))
        self.assertIsNone(self.mon._pending)

    def test_undeclared_scalar_refused_at_the_call(self):
        x, y = next(self.data)
        self.model(x, y).backward()
        self.mon.before_step(1)
        self.opt.step()
        with self.assertRaises(ValueError):
            self.mon.after_step(1, scalars={"nope": 1.0})
        self.assertIsNone(self.mon._pending)

    def test_forked_child(self):
        # a child forked while a step is measured has no thread to wait for: wait() says so,
        # close and __del__ return at once; the parent's monitor goes on
        self.step(1)

        def child():
            try:
                self.mon.wait()
                msg = "wait raised nothing"
            except stabmeter.StateError as e:
                msg = str(e)
            del self.mon
            return msg
        status, msg = in_forked_child(child, "waiting for the step measured by its parent")
        self.assertEqual(status, 0)
        self.assertIn("step 1 is measured by process %d" % os.getpid(), msg)
        self.step(2)
        self.mon.close()
        self.assertEqual(list(datasets(self.path)["step"]), [1, 2])

    def test_collected_on_its_own_thread(self):
        # the garbage collector may free a monitor in a cycle on any thread, the monitor's own
        # during a job included: there close would wait for that very job. A child interpreter
        # (a hang must not hang this one) runs __del__ inside the job; the trace gets its row.
        code = """if True:
            import os, sys, threading
            import stabmeter.torch as st
            from python_background import model_and_data, datasets, HEADS
            model, opt, data = model_and_data()
            mon = st.Monitor(model, trace=sys.argv[1], heads=HEADS, background=True)
            job, done = st._measure_job, threading.Event()
            def collected(*args):
                out = job(*args)
                mon.__del__()
                done.set()
                return out
            st._measure_job = collected
            x, y = next(data)
            model(x, y).backward()
            mon.before_step(1)
            opt.step()
            mon.after_step(1, loss=1.0)
            done.wait()
            for t in threading.enumerate():
                if t.name == "stabmeter-monitor-close":
                    t.join()
            assert not mon._m, "closed by the other thread"
            assert list(datasets(sys.argv[1])["step"]) == [1]
            print("closed")
        """
        import subprocess
        import sys
        try:
            r = subprocess.run([sys.executable, "-c", code, self.path + ".child.h5"], capture_output=True,
                               text=True, timeout=120)
        except subprocess.TimeoutExpired:
            self.fail("the monitor collected on its own thread hung")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("closed", r.stdout)

    def test_background_must_be_a_bool(self):
        with self.assertRaises(TypeError):
            st.Monitor(self.model, heads=HEADS, background=1)


def can_raise_back():
    """Whether a thread of this process can enter SCHED_IDLE and leave it (a throwaway thread)."""
    result = []

    def probe():
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            result.append(True)
        except OSError:
            result.append(False)
    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return result[0]


class IdlePriority(unittest.TestCase):
    """The measurement at idle priority is the library's (stab_monitor_measure_idle, its turn
    tested by tests/unit/check_priority): here, that the Monitor says which priority it uses, as
    the library's probe found it, and that the measuring thread has its own policy again once a
    measurement ends, whether the training waited for it or not."""

    def test_background_priority(self):
        allowed, why = st.idle_priority()
        model, opt, data = model_and_data()
        if allowed:
            mon = st.Monitor(model, heads=HEADS, background=True, priority="idle")
        else:
            with self.assertWarnsRegex(RuntimeWarning, "measuring at normal priority"):
                mon = st.Monitor(model, heads=HEADS, background=True, priority="idle")
        self.assertEqual(mon.background_priority, ("idle: " if allowed else "normal: ") + why)
        self.assertEqual(allowed, can_raise_back(), why)
        for step in (1, 2, 3):
            self.assertTrue(train_step(model, opt, data, mon, step))
            if step == 2:
                mon._pending[0].result()  # its end, without the monitor's wait (and hurry)
            mon.wait()
            tids = [t.native_id for t in mon._worker._threads]
            self.assertEqual([os.sched_getscheduler(t) for t in tids], [os.SCHED_OTHER] * len(tids),
                             "step %d: the measuring thread left at another policy" % step)
        mon.close()

    def test_without_the_right_to_raise_back(self):
        """A process without CAP_SYS_NICE (root in a container that drops it, here setpriv's
        bounding set): priority='idle' warns, measures at normal priority, and measures."""
        import shutil
        import subprocess
        import sys
        if not shutil.which("setpriv") or subprocess.run(["setpriv", "--bounding-set=-sys_nice", "true"],
                                                         capture_output=True).returncode != 0:
            self.skipTest("setpriv cannot start a child without CAP_SYS_NICE here")
        code = """if True:
            import os, warnings, torch
            import stabmeter.torch as st
            from python_background import model_and_data, train_step, HEADS
            allowed, why = st.idle_priority()
            assert not allowed and "CAP_SYS_NICE" in why, why
            model, opt, data = model_and_data()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                mon = st.Monitor(model, heads=HEADS, background=True, priority="idle")
            assert [str(w.message) for w in caught] == ["Monitor(priority='idle'): measuring at normal priority: " + why]
            assert mon.background_priority == "normal: " + why
            for step in (1, 2):
                assert train_step(model, opt, data, mon, step)
            m = mon.metrics()
            assert all(v["forward"] == v["forward"] for v in m.values()), m
            assert m["transformer.h.0.mlp.c_fc"]["update"] > 0
            mon.close()
            print("measured")
        """
        here = os.path.dirname(os.path.abspath(__file__))
        paths = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([here] + paths))
        r = subprocess.run(["setpriv", "--bounding-set=-sys_nice", sys.executable, "-c", code],
                           capture_output=True, text=True, timeout=120, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("measured", r.stdout)

    def test_synchronous_monitor_says_none(self):
        model, _, _ = model_and_data()
        mon = st.Monitor(model, heads=HEADS)
        self.assertIsNone(mon.background_priority)
        mon.close()

    def test_normal_by_default(self):
        model, _, _ = model_and_data()
        mon = st.Monitor(model, heads=HEADS, background=True)
        self.assertEqual(mon.background_priority, "normal: Monitor(priority='normal')")
        mon.close()

    def test_priority_arguments(self):
        model, _, _ = model_and_data()
        with self.assertRaisesRegex(ValueError, "priority='idle' is the background"):
            st.Monitor(model, heads=HEADS, priority="idle")
        with self.assertRaisesRegex(ValueError, "priority='low': expected one of normal, idle"):
            st.Monitor(model, heads=HEADS, background=True, priority="low")


if __name__ == "__main__":
    unittest.main()
