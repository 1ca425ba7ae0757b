"""Making tokens with a trained model, each way in one place:

sampling      GPT: a KV-cache sampler compiled once (greedy, temperature, top-k, top-p), streaming
beam_search   the encoder-decoder: greedy and beam search over a batch of sources
common        what both share: checking token ids, bucketed padding with filler rows, the mesh,
              the empty cache, cutting at the stop token
"""
