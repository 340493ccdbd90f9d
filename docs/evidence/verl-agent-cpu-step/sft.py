"""Give the tiny random policy a Sokoban action vocabulary, so that its sampled replies are a mix of valid and
invalid actions and the rewards of a group differ: SGD steps on verl-agent's Sokoban prompt (random 6x6 grids)
with targets drawn from a comma-separated list.

Usage: sft.py MODEL_DIR STEPS LR [TARGETS]   (MODEL_DIR is overwritten, in bf16; README.md has the stages run)"""
import random, sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
import os
sys.path.insert(0, os.environ.get("VA_REAL", "/tmp/va-real"))  # verl-agent checkout: its Sokoban prompt, imported
from agent_system.environments.prompts import SOKOBAN_TEMPLATE_NO_HIS

model_dir = Path(sys.argv[1])
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
torch.manual_seed(0); random.seed(0)
targets = [t for t in (sys.argv[4] if len(sys.argv) > 4 else "<think></think><action>up</action>,<think></think><action>left</action>,<action>down</action>,<action>right</action>").split(",")]
opt = torch.optim.AdamW(model.parameters(), lr=float(sys.argv[3]) if len(sys.argv) > 3 else 3e-3)
cells = [" # \t", " _ \t", " O \t", " X \t", " P \t"]
for step in range(int(sys.argv[2]) if len(sys.argv) > 2 else 200):
    grid = "\n".join("".join(random.choice(cells) for _ in range(6)) for _ in range(6))
    prompt = tok.apply_chat_template([{"role": "user", "content": SOKOBAN_TEMPLATE_NO_HIS.format(current_observation=grid)}],
                                     add_generation_prompt=True, tokenize=False)
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    t_ids = tok(random.choice(targets) + "<|im_end|>", add_special_tokens=False)["input_ids"]
    ids = torch.tensor([p_ids + t_ids]); labels = ids.clone(); labels[0, :len(p_ids)] = -100
    loss = model(input_ids=ids, labels=labels).loss
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 50 == 0:
        print(step, len(p_ids), round(loss.item(), 3), flush=True)
model.to(torch.bfloat16).save_pretrained(model_dir, safe_serialization=True)
out = model.float().generate(ids[:, :len(p_ids)], do_sample=True, max_new_tokens=32, num_return_sequences=8)
print([tok.decode(o[len(p_ids):]) for o in out])
