"""The model layer: the only package that imports torch and transformers.

=======================  ==========================================================================
module                   what is there
=======================  ==========================================================================
``protocol``             :class:`ModelBackend` (what a model must do), ``Task``, and
                         :class:`FakeBackend` (deterministic, torch-free: tests, ``--model noop``)
``batch_runner``         :class:`ModelRunner`: what the engine calls; splits a failing batch in
                         half, times each batch, feeds the counters
``torch_backend``        :class:`TorchBackend`: embed/classify with a HF model on CPU or CUDA
``sim_backend``          :class:`SimBackend`: a simulated accelerator (``--model sim:MS,US[,DIM]``)
                         that sleeps a device's time per batch and answers unit vectors
``tokenize``             the fast tokenizer stage (and the word-count stand-in of ``noop``)
``loader``               the one loader of serve, backfill and the benches: ``resolve_model``,
                         ``load_model``, ``load_runner``
``errors``               the layer's error tree (``ModelError``), torch's OOM translated at the edge
=======================  ==========================================================================
"""
