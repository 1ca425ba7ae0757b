"""Sparse autoencoders (config.task="sae", transformer/tasks/sae.py) on the residual stream of the GPTs
trained here, and on rows whose features are known.

  python -m launch.train --config=experiments/sae.py:char --workdir=workdirs/char-sae
      # TopK (k 32, 8x: 1024 latents) on the main job's resid_pre of block 2 (train it first, the README's default)
  python -m launch.train --config=experiments/sae.py:english --workdir=workdirs/english-sae
      # the same on experiments/english.py's GPT (workdirs/english-gpt)
  python -m launch.train --config=experiments/sae.py:synthetic --workdir=/tmp/sae-synthetic
      # 512 features in superposition in 64 dimensions: the decoder's recovery of them (mcc)
  python -m launch.probe --sae=workdirs/char-sae --out=features/char    # the features' pages
  python -m launch.train --config=experiments/sae.py:hf:path/to/SmolLM2-135M --config.data.input_files=my.txt \
      --config.point=mlp_input --config.target_point=mlp_output --workdir=workdirs/smollm-tc
      # a transcoder of a Hugging Face model's MLP (circuit-tracer's hooks) on your own text, read by its tokenizer

Any field changes from the command line: --config.model.activation=batchtopk (or jumprelu, relu),
--config.model.k=16, --config.point=mlp_out --config.layer=1, --config.run=another/workdir. The
activations' source is one of --config.run=WORKDIR (a GPT trained here), --config.hf=DIR (a Hugging Face
model: GPT-2 or an open family, on --config.data's text, --config.data.tokenizer=DIR for a family's),
--config.data.input_files=acts.npy (an array of your own, rows x d_in, .npy or .safetensors; leading
axes beyond two are read as rows, said in a warning) or --config.synthetic_features=N. A transcoder
(a sparse dictionary from one point to another: an MLP's input to its output) is the same run with
--config.point=mlp_in --config.target_point=mlp_out (--config.model.skip=true: with a linear skip path).
The recipe is SAELens's: Adam (betas 0.9, 0.999) without weight decay or clipping, a constant rate
after a short warmup, inputs scaled to a mean norm of √d_in, b_dec at the geometric median.
"""

from experiments import english
from transformer import tasks

PRESETS = ("char", "english", "synthetic", "tiny")
MAIN_JOB = "workdirs/shakespeare-char"


def get_config(preset: str = "char"):
  preset, _, directory = preset.partition(":")  # hf:DIR: a Hugging Face model's directory
  if preset not in (*PRESETS, "hf") or (preset == "hf") != bool(directory):
    raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}, or hf:path/to/model")
  c = tasks.defaults("sae")
  c.model.activation, c.model.k, c.model.expansion = "topk", 32, 8
  c.optimizer.update(dict(lr=4e-4, b2=0.999, weight_decay=0.0, grad_clip_norm=0.0, warmup_steps=50))
  c.optimizer.schedule = "constant"
  c.batch_size = 4096
  c.num_train_steps = 2000  # 8.2M tokens
  c.eval_every_steps = c.checkpoint_every_steps = 250
  c.dead_tokens = 2_000_000  # a quarter of the tokens a run sees (Gao et al.: 10M of billions)
  if preset == "char":
    c.run, c.point, c.layer, c.seq_len = MAIN_JOB, "resid_pre", 2, 128
  elif preset == "hf":  # its middle block's resid_pre, on config.data's text (--config.data.input_files: yours)
    c.hf, c.point, c.seq_len = directory, "resid_pre", 128
  elif preset == "english":
    c.run, c.point, c.layer, c.seq_len = english.RUN, "resid_pre", 2, 128
  elif preset == "synthetic":
    c.synthetic_features, c.synthetic_d, c.synthetic_density = 512, 64, 0.01
    c.model.k, c.model.d_sae = 8, 1024
    # JumpReLU (--config.model.activation=jumprelu) starts sparse, each latent's θ₀ set from the first rows
    # so that it fires on 0.1% of them (model.initial_density): 98% of the 512 features are found. From
    # SAELens's fixed θ₀ 0.01 every latent fires on half the rows, a dense code forms and none is
    # (experiments/README.md).
    c.optimizer.lr = 3e-3
    c.num_train_steps = 1500
    c.dead_tokens = 1_000_000
  else:  # tiny: a few steps of synthetic rows, for smoke runs
    c.synthetic_features, c.synthetic_d = 64, 16
    c.model.k, c.model.d_sae = 4, 128
    c.batch_size, c.num_train_steps = 256, 20
    c.eval_every_steps = c.checkpoint_every_steps = 10
  return c
