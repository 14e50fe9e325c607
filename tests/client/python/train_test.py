"""The example GPT (client/python/examples/train_gpt.py) trained through the service on 2 cpu
workers beside the same model with local SDPA: the two loss curves agree within the dtype's
tolerance at every step, the loss goes down, and each attention layer kept one session for the
whole run (a training step makes no CreateSession/Release calls).

fp32: 12 steps, 2 layers, GQA (4/2 heads), gradient accumulation over 2 micro-batches.
bf16: 4 steps under torch.autocast(bfloat16) on both sides.

Run: DFA_BIN_DIR=<build> PYTHONPATH=<build>/client/python python3 tests/client/python/train_test.py
"""

import importlib.util
import os
import unittest

_EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "client",
                        "python", "examples", "train_gpt.py")
spec = importlib.util.spec_from_file_location("train_gpt", _EXAMPLE)
train_gpt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train_gpt)


class TrainTest(unittest.TestCase):
    def run_example(self, *argv):
        args = train_gpt.parser().parse_args(list(argv))
        r = train_gpt.run(args)
        tol = train_gpt.tolerance(args.dtype)
        for step, (a, b) in enumerate(zip(r["local"], r["service"])):
            self.assertLessEqual(abs(a - b), tol, "step %d: local %.6f, service %.6f" % (step, a, b))
        self.assertEqual(len(r["service"]), args.steps)
        for stats in r["layer_stats"]:
            self.assertEqual(stats["sessions"], 1, stats)  # one session per layer, all steps
            self.assertEqual(stats["forwards"], args.steps * args.accumulate)
            self.assertEqual(stats["backwards"], args.steps * args.accumulate)
            self.assertEqual(stats["retries"], 0)
        before, after = r["sessions"]
        self.assertEqual(after, before + args.layers)  # the layers' sessions, held to the end
        return r

    def test_fp32_curves_agree_and_loss_falls(self):
        r = self.run_example("--steps", "12", "--accumulate", "2", "--dtype", "f32")
        self.assertLess(sum(r["service"][-3:]) / 3, r["service"][0] - 0.3)

    def test_bf16_autocast_curves_agree(self):
        self.run_example("--steps", "4", "--dtype", "bf16")


if __name__ == "__main__":
    unittest.main(verbosity=2)
