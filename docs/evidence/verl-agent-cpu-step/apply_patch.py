"""Apply docs/verl-agent.md's Quick-start patch to verl/trainer/ppo/ray_trainer.py of a verl-agent checkout
(argument: its root). The three edits of the doc, matched on the lines the doc's diff shows."""
import sys
from pathlib import Path

path = Path(sys.argv[1]) / "verl/trainer/ppo/ray_trainer.py"
s = path.read_text()
anchor = "        from verl.utils.tracking import Tracking\n"
assert s.count(anchor) == 1
s = s.replace(anchor, anchor + "        from oma.integrations.verl_agent import check_config, compute_advantage as oma_compute_advantage\n"
              "        print(check_config(self.config))  # refuses what oma cannot carry, before the first rollout\n")
adjust = "                    batch = adjust_batch(self.config, batch)\n"
assert s.count(adjust) == 1
s = s.replace(adjust, '                    batch.non_tensor_batch["row_id"] = np.arange(len(batch))  # copies repeat their original\'s\n' + adjust)
start = s.index("                        batch = compute_advantage(\n                            batch,\n")
end_mark = "gigpo_similarity_thresh=self.config.algorithm.gigpo.similarity_thresh,\n                        )\n"
end = s.index(end_mark, start) + len(end_mark)
s = s[:start] + "                        batch = oma_compute_advantage(batch, self.config, metrics, iteration=self.global_steps)\n" + s[end:]
path.write_text(s)
print("patched", path)
