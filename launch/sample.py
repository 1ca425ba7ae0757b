r"""Samples text from a training workdir's checkpoint or from GPT-2 safetensors.

  python -m launch.sample --workdir=workdirs/shakespeare-char --prompt="ROMEO:" --max_new_tokens=300
  python -m launch.sample --workdir=workdirs/shakespeare-char --step=best --prompt="KING:" \
      --prompt="To be" --num_samples=3 --temperature=0.8 --top_p=0.95
  python -m launch.sample --hf=path/to/gpt2 --prompt="Every effort moves you" --stream
  python -m launch.sample --hf=path/to/SmolLM2-135M --prompt="Once upon a time"    # Llama, Qwen, Gemma, Pythia, ...
  python -m launch.sample --workdir=workdirs/smollm-ft --export=smollm-ft-hf    # a run back to the Hugging Face format
  echo "Alas, poor" | python -m launch.sample --workdir=workdirs/shakespeare-char --prompts_file=-

Prompts come from --prompt (repeatable), or --prompts_file (one per line; "-" is stdin; write "\n"
for a newline inside a prompt). An empty prompt starts from <|endoftext|>: a fresh document; a
prompt that contains <|endoftext|> is refused unless --allow_special.
--temperature=0 is greedy decoding. Prompt + --max_new_tokens must fit in the model's context
unless --sliding_window (slower: no KV cache).
"""

import sys
from pathlib import Path

from absl import flags

import launch
from transformer import cli
from transformer.errors import UserError
from transformer.generation import sampling
from transformer.models import formats

_MODEL = launch.ModelFlags(
  "A training workdir (launch.train's --workdir).",
  hf_help=launch.HF_HELP,
)
_PROMPT = flags.DEFINE_multi_string("prompt", [], "A prompt; repeat the flag for several.")
_PROMPTS_FILE = flags.DEFINE_string("prompts_file", None, "One prompt per line; '-' reads stdin.")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 200, "At most this many tokens per completion.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "Softmax temperature; 0 is greedy.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Sample among the k most likely tokens only (0: all).")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus sampling: the fewest tokens with this much probability.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1, "Completions per prompt.")
_SEED = flags.DEFINE_integer("seed", 0, "Random seed.")
_STREAM = flags.DEFINE_bool("stream", False, "Print tokens as they are made (completions one at a time).")
_ALLOW_SPECIAL = flags.DEFINE_bool(
  "allow_special",
  False,
  "Encode special tokens written in a prompt (e.g. <|endoftext|>) as such; without it such a prompt is refused.",
)
_SLIDING_WINDOW = flags.DEFINE_bool(
  "sliding_window",
  False,
  "Allow prompt + new tokens beyond the context by re-reading the last max_len tokens for each new one (slow).",
)


_EXPORT = flags.DEFINE_string(
  "export",
  None,
  "Write --workdir's model (at --step) into this new directory as a Hugging Face model, with its tokenizer.json; "
  "nothing is sampled.",
)
_EXPORT_AS = flags.DEFINE_string(
  "export_as",
  None,
  "With --export: the model_type to write (llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, olmo2, "
  "gpt_neox, gpt2); default: that of the model the run was fine-tuned from (config.init_from), else gpt2.",
)


def _export() -> None:
  if _MODEL.hf.value or _PROMPT.value or _PROMPTS_FILE.value:
    raise UserError("--export writes --workdir's model (at --step); give it alone")
  out = Path(_EXPORT.value)
  if out.exists() and any(out.iterdir()):
    raise UserError(f"--export={out} is not empty; give a new directory (nothing there is overwritten)")
  trained = _MODEL.load("lm")
  source = trained.run.task_config.init_from
  model_type = _EXPORT_AS.value or (formats.model_type(source) if formats.is_open_model(source) else "gpt2")
  formats.export_lm(trained.task.model_config, trained.params, out, model_type, trained.tokenizer)
  print(f"wrote {out} ({model_type}): AutoModelForCausalLM.from_pretrained({str(out)!r}) loads it")


def read_prompts() -> list[str]:
  prompts = list(_PROMPT.value)
  prompts += [line.replace("\\n", "\n") for line in cli.read_inputs([], _PROMPTS_FILE.value, "prompts_file")]
  return prompts or [""]


def main(argv):
  del argv
  if _EXPORT.value:
    return _export()
  prompts = read_prompts()
  trained = _MODEL.load("lm")
  model, params, tokenizer, source = trained.model, trained.params, trained.tokenizer, trained.source
  how = sampling.Sampling(temperature=_TEMPERATURE.value, top_k=_TOP_K.value, top_p=_TOP_P.value)
  print(f"# {source}: {len(prompts)} prompt(s) x {_NUM_SAMPLES.value}, {how}", file=sys.stderr)
  options = dict(
    max_new_tokens=_MAX_NEW_TOKENS.value,
    sampling=how,
    seed=_SEED.value,
    num_samples=_NUM_SAMPLES.value,
    mesh=trained.mesh,
    rules=trained.rules,
    sliding_window=_SLIDING_WINDOW.value,
    allow_special=_ALLOW_SPECIAL.value,
  )
  if _STREAM.value:
    sampling.complete(model, params, tokenizer, prompts, stream=sys.stdout, **options)
    return
  completions = sampling.complete(model, params, tokenizer, prompts, **options)
  for i, completion in enumerate(completions):
    if i:
      print("-" * 40)
    print(prompts[i // _NUM_SAMPLES.value] + completion)


if __name__ == "__main__":
  cli.run(main)
