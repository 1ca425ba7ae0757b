"""Part-of-speech tagging of the Brown corpus (1.16M words, 500 samples split by sample: 80/10/10),
Brown's own tags or the 12 universal ones; a BiLSTM and an encoder-only Transformer, beside the
most-frequent-tag baseline every run prints. Each preset trains in a few minutes on 2 CPU cores.

  python -m launch.train --config=experiments/pos.py:bilstm  --workdir=workdirs/pos-bilstm
  python -m launch.train --config=experiments/pos.py:encoder --workdir=workdirs/pos-encoder
  python -m launch.train --config=experiments/pos.py:lstm    --workdir=workdirs/pos-lstm   # left to right only
  python -m launch.train --config=experiments/pos.py:gpt_english --workdir=workdirs/pos-ge   # also _scratch, _frozen
  python -m launch.tag --workdir=workdirs/pos-bilstm --text="The jury said it did not find any evidence ."

  --config.data.tagset=universal          NOUN, VERB, ADJ, ... (Petrov et al. 2012)
  --config.data.input_files=tagged.txt    your own `word/TAG` sentences, one a line
  --config.data.tokenizer=gpt2            subwords: a word's tag at its first token
"""

from experiments import base, english

PRESETS = ("bilstm", "lstm", "encoder", *english.LABELLED_PRESETS, "tiny")


def get_config(preset: str = "bilstm"):
  if preset not in PRESETS:
    raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
  # Words: the 20,000 most frequent of the training split; 4,000 steps, ~2.8 epochs of its 46k sentences.
  c = base.labelled_config("tagging", "brown", vocab_size=20000, num_train_steps=4000, eval_every_steps=1000, lr=2e-3)
  c.data.tagset = "brown"
  if preset in ("bilstm", "lstm"):
    c.model = base.family_fields("lstm", num_layers=1, d_model=128, dropout_rate=0.2, bidirectional=preset == "bilstm")
  elif preset == "encoder":
    c.model = base.family_fields(
      "encoder", max_len=64, num_layers=2, num_heads=4, d_model=128, d_mlp=512, dropout_rate=0.1
    )
  elif preset in english.LABELLED_PRESETS:  # left to right: each word's tag from the words before it
    english.labelled_body(c, preset)
    c.num_train_steps = 2000
    c.optimizer.lr = 5e-4
  else:
    base.tiny_labelled(c, base.family_fields("lstm", num_layers=1, d_model=32, bidirectional=True))
  return c
