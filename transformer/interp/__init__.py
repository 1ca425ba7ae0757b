"""The interpretability instrument: what reads, changes and explains a model's insides, one concern a module:

interventions     named points read and patched (run_with_cache, run_with_patches, Patch), head scores
activation_cache  the residual stream's algebra over a cache (TransformerLens's ActivationCache)
patching          patching sweeps, attribution patching, path patching, edge attribution
probing           linear probes and distributed alignment search
probes            what launch.probe draws: attention maps, residual norms, the logit lens, embeddings
probe_page        one page (index.html) of everything a probe run wrote
studies           launch.probe's verbs as calls with arguments (heads, attribution, patching, circuits)
features          an SAE's features: top contexts, histograms, the logits they promote (features.html)
fourier           grokking's Fourier progress measures
replacement       the model with its MLPs replaced by transcoders (one a layer, or cross-layer): losses, shared parts
graph             attribution graphs through transcoders: the local replacement model, edges, feature interventions
graph_view        pruning a graph, its scores, circuit-tracer's viewer JSON; graph_page: its HTML page
graph_targets     what a graph explains; graph_selection: which features a cap keeps as nodes
"""
