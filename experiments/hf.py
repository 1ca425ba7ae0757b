"""Fine-tuning a Hugging Face language model (an open family's: Llama, Mistral, Qwen2/3, SmolLM, Gemma 1-3,
Pythia, OLMo 2; or GPT-2's) on your text, its model, tokenizer and weights taken from the directory
(transformer.tasks.lm.hf_defaults):

  python -m launch.train --config=experiments/hf.py:path/to/SmolLM2-135M \\
      --config.data.input_files=my_text.txt --workdir=workdirs/smollm-ft
  python -m launch.sample --workdir=workdirs/smollm-ft --prompt="Once upon a time"
  python -m launch.sample --workdir=workdirs/smollm-ft --export=exported/   # back to the Hugging Face format

  --config.optimizer.lr=1e-5 --config.num_train_steps=1000   the schedule (AdamW, 10 warmup steps)
  --config.seq_len=512 --config.batch_size=16                 the windows (seq_len <= the model's context)
  --config.model.kernels=reference --config.model.remat_policy=dots   as for any run
"""

from transformer.tasks import lm


def get_config(directory: str = ""):
  if not directory:
    raise ValueError("give the model's directory: --config=experiments/hf.py:path/to/model")
  return lm.hf_defaults(directory)
