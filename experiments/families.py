"""The open families' published shapes (experiments/shapes.py: Llama 3 8B, Llama 3.2 1B,
SmolLM2 135M, Mistral 7B, Qwen3 0.6B, Gemma 2 2B, Pythia 70M, OLMo 2 1B) as language-model runs: to plan
their memory and FLOPs on a mesh before renting one, or to train one from scratch. (To start from a
checkpoint's weights instead: experiments/hf.py:DIR.)

  python -m launch.plan --config=experiments/families.py:llama3-8b --devices=8 --config.mesh.fsdp=8
  python -m launch.plan --config=experiments/families.py:gemma2-2b --devices=8 --config.mesh.fsdp=8 \\
      --config.model.remat_policy=dots --device_memory_gib=80     # the largest batch that fits an H100
  python -m launch.train --config=experiments/families.py:smollm2-135m --workdir=workdirs/smollm \\
      --config.data.dataset=tinystories

bfloat16 compute with float32 master weights, scanned layers (one compiled block), 2,048-token windows
(or the model's context, if shorter), AdamW with the Llama recipe's betas, decay and clipping. The data
is tokenized with GPT-2's tokenizer unless --config.data.tokenizer names another (a family's
tokenizer.json directory); the vocabulary stays the family's.
"""

from experiments import base, shapes
from transformer import config as run_config


def get_config(name: str = "smollm2-135m"):
  model = shapes.shape(name, dtype="bfloat16", param_dtype="float32", scan_layers=True)
  c = base.lm_config()
  c.model = run_config.model_dict(model)
  c.data.tokenizer = "gpt2"
  c.seq_len = min(2048, model.max_len)
  c.batch_size = 256
  c.optimizer.lr, c.optimizer.warmup_steps, c.optimizer.weight_decay = 3e-4, 2000, 0.1
  c.optimizer.b2 = 0.95
  return c
