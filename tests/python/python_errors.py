"""Bad inputs raise, before any pointer reaches C or with the library's own message, and none
crashes the interpreter: wrong dtypes, dimensions and orders, a column-strided view, the
library's own refusals (stabmeter.Error subclasses), parameters moved, replaced or freed under
a Monitor, a closed monitor, a CUDA tensor (where there is a GPU)."""

import gc
import os
import tempfile
import unittest
import warnings

import numpy as np
import torch

import stabmeter
import stabmeter.torch as st
from python_gpt import GPT
from python_util import in_forked_child


class ArrayErrors(unittest.TestCase):
    def setUp(self):
        self.a = np.random.default_rng(0).standard_normal((40, 30)).astype(np.float32)

    def test_dtypes(self):
        for bad in (self.a.astype(np.float64), self.a.astype(np.int32), self.a.astype(">f4"),
                    torch.from_numpy(self.a).double()):
            with self.assertRaisesRegex(TypeError, "dtype"):
                stabmeter.sigma(bad)
        with self.assertRaisesRegex(TypeError, "dtype"):
            stabmeter.sigma(self.a.astype(np.float16))  # layer_metrics reads it; sigma is f32
        with self.assertRaisesRegex(TypeError, "numpy array or a torch tensor"):
            stabmeter.sigma([[1.0, 2.0]])

    def test_dimensions(self):
        with self.assertRaisesRegex(ValueError, "3-D"):
            stabmeter.sigma(np.zeros((2, 3, 4), np.float32))
        with self.assertRaisesRegex(ValueError, "1-D"):
            stabmeter.layer_metrics("linear", np.zeros(5, np.float32))
        with self.assertRaisesRegex(ValueError, "zero side"):
            stabmeter.sigma(np.zeros((0, 4), np.float32))
        with self.assertRaisesRegex(ValueError, r"bias: shape \(7,\).*40 outputs"):
            stabmeter.layer_metrics("linear", self.a, bias=np.zeros(7, np.float32))
        with self.assertRaisesRegex(ValueError, "before: shape"):
            stabmeter.layer_metrics("linear", self.a, before=self.a[:, :10])
        with self.assertRaisesRegex(ValueError, "weight_k"):
            stabmeter.layer_metrics("attention", self.a, heads=2)

    def test_orders(self):
        with self.assertRaisesRegex(TypeError, "apart along a row"):
            stabmeter.sigma(self.a.T)
        with self.assertRaisesRegex(TypeError, "dtype"):
            stabmeter.sigma(self.a.astype(np.float64)[:, ::2])  # non-contiguous f64
        with self.assertRaisesRegex(TypeError, "apart along a row"):
            stabmeter.sigma(torch.from_numpy(self.a).t())
        with self.assertRaisesRegex(TypeError, "row stride"):
            stabmeter.sigma(np.lib.stride_tricks.as_strided(self.a, (10, 30), (4, 4)))  # overlapping rows

    def test_library_errors_carry_its_message(self):
        with self.assertRaises(stabmeter.InvalidArgument) as c:
            stabmeter.sigma(self.a, tol=5)
        self.assertIsInstance(c.exception, stabmeter.Error)
        self.assertEqual(c.exception.status, -1)
        self.assertIn("tol", str(c.exception))
        with self.assertRaises(stabmeter.RangeError) as c:
            stabmeter.layer_metrics("attention", self.a, weight_k=self.a, heads=7)  # 7 heads of 40 outputs
        self.assertIn("heads", c.exception.message)
        with self.assertRaisesRegex(ValueError, "kind='conv'"):
            stabmeter.layer_metrics("conv", self.a)

    def test_cuda(self):
        if not torch.cuda.is_available():
            self.skipTest("no CUDA device here")
        with self.assertRaisesRegex(TypeError, "CPU memory"):
            stabmeter.sigma(torch.zeros(4, 4, device="cuda"))


class MonitorErrors(unittest.TestCase):
    def step(self, model, mon, opt, step):
        x = torch.randint(0, 256, (2, 8))
        loss = model(x, x)
        opt.zero_grad()
        loss.backward()
        mon.before_step(step)
        opt.step()
        return mon.after_step(step, loss=loss.item())

    def setUp(self):
        torch.manual_seed(0)
        self.model = GPT(width=16, depth=1, heads=2, context=8)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def test_moved(self):
        mon = st.Monitor(self.model, heads=2)
        self.step(self.model, mon, self.opt, 1)
        self.model.double()  # every parameter's .data replaced: the old storage would be freed
        with self.assertRaisesRegex(stabmeter.StateError, "has moved"):
            mon.before_step(2)
        mon.close()

    def test_replaced(self):
        mon = st.Monitor(self.model, heads=2)
        self.model.transformer.h[0].mlp.c_fc = torch.nn.Linear(16, 64, bias=False)
        with self.assertRaisesRegex(stabmeter.StateError, "transformer.h.0.mlp.c_fc.weight has moved"):
            mon.after_step(1)
        mon.close()

    def test_freed_model_is_never_read_freed(self):
        mon = st.Monitor(self.model, heads=2)
        want = mon.measure()
        del self.model, self.opt
        gc.collect()
        # the model is gone; the monitor holds the storage it reads, and says so
        for call in (lambda: mon.before_step(1), mon.measure):
            with self.assertRaisesRegex(stabmeter.StateError, "model was freed"):
                call()
        self.assertEqual(repr(mon.metrics()), repr(want))  # the last measurement stays (NaN alike)
        mon.close()

    def test_after_step_without_before_step_warns_once(self):
        mon = st.Monitor(self.model, heads=2)
        with self.assertWarnsRegex(RuntimeWarning, r"after_step\(1\): no before_step"):
            self.assertTrue(mon.after_step(1))
        self.assertTrue(all(r["update"] != r["update"] for r in mon.metrics().values() if r["kind"] == "linear"))
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # said once: the next step's silence is no error
            mon.after_step(2)
            self.step(self.model, mon, self.opt, 3)  # with before_step: updates measured
        self.assertTrue(all(r["update"] > 0 for r in mon.metrics().values() if r["kind"] == "linear"))
        mon.close()

    def test_arguments_named(self):
        # a typo is refused, not ignored; an integer out of its C type is refused, not wrapped
        with self.assertRaisesRegex(ValueError, r"^Monitor: kinds\['\*wte\*'\]='embeding'.*embedding"):
            st.Monitor(self.model, heads=2, kinds={"*wte*": "embeding"})
        with self.assertRaisesRegex(ValueError, r"^Monitor: layouts\['\*c_fc\*'\]='in-major'.*in_major"):
            st.Monitor(self.model, heads=2, layouts={"*c_fc*": "in-major"})
        for kw, bad in (("heads", -1), ("heads", 2 ** 64), ("kv_heads", -2), ("every", 0), ("every", 2 ** 70),
                        ("flush_every", 2 ** 40), ("threads", 2 ** 40)):
            with self.assertRaisesRegex(ValueError, r"^Monitor: %s=%d" % (kw, bad)):
                st.Monitor(self.model, **dict({"heads": 2}, **{kw: bad}))
        with self.assertRaisesRegex(ValueError, r"^Monitor: tight='centered'.*centred"):
            st.Monitor(self.model, heads=2, tight="centered")
        # a parameter at an odd address (a view into bytes): refused, naming it
        model = torch.nn.Sequential(torch.nn.Linear(16, 16, bias=False))
        buf = bytearray(4 * 16 * 16 + 4)
        w = torch.frombuffer(buf, dtype=torch.float32, count=256, offset=1).view(16, 16)
        model[0].weight = torch.nn.Parameter(w, requires_grad=False)
        with self.assertRaisesRegex(TypeError, r"^Monitor: parameter 0\.weight.*aligned"):
            st.Monitor(model)
        mon = st.Monitor(self.model, heads=2)
        with self.assertRaisesRegex(ValueError, r"step=%d" % 2 ** 63):
            mon.after_step(2 ** 63)
        mon.close()

    def test_forked_child_leaves_the_trace(self):
        # a child of a process with a traced Monitor: its after_step fails naming the parent,
        # its close and __del__ return at once and touch nothing; the parent's trace goes on
        import h5py
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.h5")
            mon = st.Monitor(self.model, heads=2, trace=path)
            self.step(self.model, mon, self.opt, 1)

            def child():
                nonlocal mon
                try:
                    mon.after_step(2, loss=1.0)
                    msg = "after_step raised nothing"
                except stabmeter.StateError as e:
                    msg = str(e)
                del mon  # in_forked_child's gc.collect(): __del__ closes the child's copy
                return msg
            status, msg = in_forked_child(child, "closing its copy of the trace")
            self.assertEqual(status, 0)
            self.assertIn("belongs to process %d" % os.getpid(), msg)
            self.step(self.model, mon, self.opt, 2)
            mon.close()
            with h5py.File(path, "r") as f:
                self.assertEqual(list(f["step"][:]), [1, 2])

    def test_closed(self):
        mon = st.Monitor(self.model, heads=2)
        mon.close()
        mon.close()  # twice is fine
        for call in (mon.measure, mon.metrics, lambda: mon.before_step(1)):
            with self.assertRaisesRegex(stabmeter.StateError, "closed"):
                call()

    def test_types(self):
        # float16 and bfloat16 are read as stored (python_models.py checks the values); float64 is not
        with self.assertRaisesRegex(ValueError, r"no parameter is a layer; 0 of \d+ parameters .*dtype FLOAT64"):
            st.Monitor(GPT(width=16, depth=1, heads=2, context=8).double(), heads=2)
        experts = torch.nn.Module()  # a 3-D expert tensor in bfloat16: its slices read as stored
        experts.blk = torch.nn.Module()
        experts.blk.ffn_up_exps = torch.nn.Parameter(torch.randn(4, 8, 16, dtype=torch.bfloat16))
        experts.blk.fc = torch.nn.Linear(16, 8)
        experts.blk.fc.weight.data = experts.blk.fc.weight.data.to(torch.bfloat16)  # its bias stays float32
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            with st.Monitor(experts) as mon:
                self.assertIn("blk.ffn_up_exps.3", dict(mon.layers))
                self.assertRegex(mon.skipped["blk.fc"], r"different types \(BF16, F32\)")
        self.assertTrue(any("blk.fc (its tensors are of different types" in str(w.message) for w in record))
        with self.assertRaisesRegex(TypeError, "torch.nn.Module"):
            st.Monitor({"a": torch.zeros(3, 3)})

    def test_trace_errors(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(stabmeter.Error) as c:
                st.Monitor(self.model, heads=2, trace=d)  # a directory
            self.assertIn(d, c.exception.message)
            with st.Monitor(self.model, heads=2, trace=os.path.join(d, "u.h5")) as mon:
                self.step(self.model, mon, self.opt, 2)
                with self.assertRaisesRegex(stabmeter.RangeError, "step"):
                    self.step(self.model, mon, self.opt, 1)  # steps must increase
                with self.assertRaisesRegex(ValueError, "not declared"):
                    mon.after_step(3, scalars={"accuracy": 1.0})


if __name__ == "__main__":
    unittest.main()
