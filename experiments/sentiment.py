"""Sentiment of movie-review snippets (VADER's ~10.6k, rated -4..+4; binary by the sign: see
transformer/tasks/classification.py), by each model the seeds compare. Each preset trains in a few
minutes on 2 CPU cores.

  python -m launch.train --config=experiments/sentiment.py:lstm    --workdir=workdirs/sentiment-lstm
  python -m launch.train --config=experiments/sentiment.py:bilstm  --workdir=workdirs/sentiment-bilstm
  python -m launch.train --config=experiments/sentiment.py:encoder --workdir=workdirs/sentiment-encoder
  python -m launch.train --config=experiments/sentiment.py:gpt     --workdir=workdirs/sentiment-gpt
  # the main job's Shakespeare GPT (workdirs/shakespeare-char), fine-tuned with a classification head:
  python -m launch.train --config=experiments/sentiment.py:gpt_finetune --workdir=workdirs/sentiment-gpt-finetune
  # the general-English GPT (experiments/english.py, workdirs/english-gpt): from scratch with its
  # tokenizer, its body frozen under a trained head (a linear probe), or fine-tuned:
  python -m launch.train --config=experiments/sentiment.py:gpt_english_scratch --workdir=workdirs/sentiment-ge-scratch
  python -m launch.train --config=experiments/sentiment.py:gpt_english_frozen --workdir=workdirs/sentiment-ge-frozen
  python -m launch.train --config=experiments/sentiment.py:gpt_english --workdir=workdirs/sentiment-ge
  python -m launch.classify --workdir=workdirs/sentiment-encoder --text="A gorgeous, witty, seductive movie."

  --config.classes=three                       negative / neutral / positive
  --config.data.input_files=reviews.tsv        your own `label<TAB>text` lines (with --config.classes=names)
  --config.init_from=path/to/gpt2              Hugging Face GPT-2 weights (with --config.data.tokenizer=gpt2)
"""

from experiments import base, english, shakespeare

PRESETS = ("lstm", "bilstm", "encoder", "gpt", "gpt_finetune", *english.LABELLED_PRESETS, "tiny")
# The README main job's run: its GPT is the body `gpt_finetune` starts from.
SHAKESPEARE_RUN = "workdirs/shakespeare-char"


def get_config(preset: str = "encoder"):
  if preset not in PRESETS:
    raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
  # Words: the 8,000 most frequent of the training split, lower-cased (99% of the snippets are
  # shorter than 64); 1,500 steps, ~6 epochs of its 8.5k snippets.
  c = base.labelled_config(
    "classification", "vader", vocab_size=8000, num_train_steps=1500, eval_every_steps=250, lr=1e-3
  )
  c.data.lowercase = True
  if preset in ("lstm", "bilstm"):
    c.model = base.family_fields("lstm", num_layers=1, d_model=256, dropout_rate=0.3, bidirectional=preset == "bilstm")
  elif preset == "encoder":
    c.model = base.family_fields(
      "encoder", max_len=64, num_layers=2, num_heads=4, d_model=128, d_mlp=512, dropout_rate=0.3
    )
  elif preset in ("gpt", "gpt_finetune"):
    # Characters and the main job's GPT (its model config exactly, with dropout), from scratch or
    # from that run: the comparison is pretraining alone. Reviews are cut to their first 128 characters.
    c.model = shakespeare.get_config("char").model
    c.model.block.dropout_rate = 0.1
    c.max_len = 128
    c.num_train_steps = 1000
    c.optimizer.lr = 5e-4
    if preset == "gpt":
      c.data.tokenizer = "char"
    else:
      c.init_from = SHAKESPEARE_RUN
      c.data.tokenizer = f"{SHAKESPEARE_RUN}/tokenizer"  # its characters (others fold or drop)
  elif preset in english.LABELLED_PRESETS:
    english.labelled_body(c, preset)
    c.max_len = 64  # BPE tokens; 99% of the snippets are shorter
    c.num_train_steps = 1000
    c.optimizer.lr = 5e-4
  else:
    base.tiny_labelled(c, base.family_fields("encoder", max_len=32, num_layers=1, num_heads=2, d_model=32, d_mlp=64))
  return c
