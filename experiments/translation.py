"""The encoder-decoder Transformer on German–English sentence pairs (the Ding dictionary's example
sentences, ~19k pairs, from Debian's trans-de-en package), scored with sacreBLEU.

  python -m launch.train --config=experiments/translation.py:cpu  --workdir=workdirs/de-en  # 2 CPU cores, 8-10 min
  python -m launch.train --config=experiments/translation.py:cpu_long --workdir=workdirs/de-en-long  # ~45 min
  python -m launch.train --config=experiments/translation.py:tiny --workdir=/tmp/tiny-mt    # seconds: smoke test
  python -m launch.train --config=experiments/translation.py:base --workdir=workdirs/base  # paper's base, accelerator
  python -m launch.translate --workdir=workdirs/de-en --sentence="Ich habe keine Zeit."

Fine-tuning a Marian model (a Helsinki-NLP/opus-mt-* directory: MarianMTModel + MarianTokenizer files)
on your pairs, its model, tokenizer pair and weights taken from the directory:

  python -m launch.train --config=experiments/translation.py:marian=path/to/opus-mt-de-en \
      --config.data.input_files=pairs.tsv --workdir=workdirs/opus-ft

  --config.data.direction=en-de           the other way
  --config.data.input_files=pairs.tsv     your own pairs (source<TAB>target a line); direction source-target
  --config.data.tokenizer=cl100k_base     a tiktoken encoding instead of the joint BPE trained on the pairs
  --config.data.fuzzy_match_tokens=64 --config.model.max_len=128
                                          each source followed by its fuzzy match (neural fuzzy repair)
  --config.seed=1                         another run of the recipe: runs of seeds 0..4 decode as one
                                          (launch.translate --ensemble), ~1.5 BLEU above one run (README)
"""

from experiments import base
from transformer import tasks
from transformer.models import seq2seq
from transformer.tasks import translation

PRESETS = ("cpu", "cpu_long", "tiny", "base", "big")


def get_config(preset: str = "cpu"):
  if preset.startswith("marian="):
    return marian(preset.removeprefix("marian="))
  if preset not in PRESETS:
    raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}, or marian=DIR")
  c = tasks.defaults("translation")  # 4096-token batches, label smoothing 0.1, beam 4 (TranslationConfig)
  c.data.dataset = "ding_de_en"
  c.data.tokenizer = "bpe"  # a joint source+target BPE trained on the pairs (rustbpe), or a tiktoken name
  c.data.vocab_size = 8000
  # data.direction "" is the data set's column order: de-en for Ding, source-target for your TSV.
  c.data.validation_fraction = 0.05
  c.data.test_fraction = 0.05

  # The paper's Adam (b2 0.98, eps 1e-9, no weight decay) and inverse-square-root schedule.
  c.optimizer.schedule = "inverse_sqrt"
  c.optimizer.b2 = 0.98
  c.optimizer.eps = 1e-9
  c.optimizer.weight_decay = 0.0

  if preset in ("cpu", "cpu_long"):
    # Pre-LN trains faster than the paper's post-LN (on this data, dev perplexity 74 vs 167 after 400
    # steps); a small joint BPE and small batches give more updates per minute. On 2 cores a run is
    # compute-bound (~5k target tokens/s whatever the batch), so the model is sized for the budget.
    # The README's "What each lever gives" has the measurements behind each choice.
    c.model = base.model_fields("cpu-small", seq2seq, pre_layer_norm=True)
    c.data.vocab_size = 4000  # fewer tokens a sentence than 2,000: more sentences a step (README rows 16-19, 32)
    c.batch_tokens = 1024
    c.eval.bleu_sentences = 300
    c.optimizer.schedule = "cosine"  # for a fixed budget; inverse_sqrt at 3e-3 stays too high too long
    c.optimizer.lr = 1e-3
    c.optimizer.warmup_steps = 200
    if preset == "cpu":  # 8-10 minutes: 2+2 layers, a narrow MLP
      c.model.num_layers = 2
      c.model.block.d_mlp = 512
      c.num_train_steps = 4500
      c.eval_every_steps = c.checkpoint_every_steps = 1500
    else:  # under an hour: 3+3 layers, ~40 epochs, so more dropout; the mean of the last 5 checkpoints
      c.model.block.dropout_rate = 0.2
      c.num_train_steps = 11000
      c.eval_every_steps = 1000
      c.checkpoint_every_steps = 500
      c.keep_checkpoints = 5
      c.eval.average_last = 5
  elif preset == "tiny":  # for tests and smoke runs
    c.model = base.model_fields("cpu-tiny", seq2seq)
    c.data.max_len = 32
    c.batch_tokens = 512
    c.num_train_steps = 20
    c.log_every_steps = 5
    c.eval_every_steps = c.checkpoint_every_steps = 10
    c.eval.bleu_sentences = 16
    c.eval.test_sentences = 16  # a smoke run's test BLEU means nothing; decoding more only costs time
    c.eval.beam_size = 2
    c.optimizer.warmup_steps = 5
  else:  # the paper's base / big (section 6.1: 4000 warmup steps, lr d^-0.5 * 4000^-0.5 at the peak)
    c.model = base.model_fields(f"transformer_{preset}", seq2seq)
    c.data.max_len = 256
    c.batch_tokens = 25000
    c.num_train_steps = 100_000
    c.eval_every_steps = c.checkpoint_every_steps = 5000
    c.optimizer.warmup_steps = 4000
    c.optimizer.lr = (c.model.block.d_model * 4000) ** -0.5
    c.optimizer.grad_clip_norm = 0.0
  return c


def marian(directory: str):
  """Fine-tuning the Marian model in `directory` (tasks.translation.marian_defaults: its model, tokenizer
  pair and weights; Ding's pairs unless --config.data.input_files) with a fine-tuning's small steps:
  AdamW at 5e-5 after 100 warmup steps, label smoothing 0.1 as OPUS-MT trained, a score every 250 steps."""
  c = translation.marian_defaults(directory)
  c.batch_tokens = 2048
  c.optimizer.lr = 5e-5
  c.optimizer.warmup_steps = 100
  c.optimizer.weight_decay = 0.0
  c.num_train_steps = 1000
  c.eval_every_steps = c.checkpoint_every_steps = 250
  c.eval.bleu_sentences = 200
  return c
