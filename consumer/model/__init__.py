"""The model layer: the only package that imports torch, transformers, ONNX Runtime and
sentence-transformers.

=======================  ==========================================================================
module                   what is there
=======================  ==========================================================================
``protocol``             :class:`ModelBackend` (what a model must do), ``Task``, and
                         :class:`FakeBackend` (deterministic, torch-free: tests, ``--model noop``)
``batch_runner``         :class:`ModelRunner`: what the engine calls; splits a failing batch in
                         half, times each batch, feeds the counters
``torch_backend``        :class:`TorchBackend`: embed/classify with a HF model on CPU or CUDA
``task_backends``        contract 1.2: rerank (cross-encoder pairs), sparse (SPLADE), token-classify
``sim_backend``          :class:`SimBackend`: a simulated accelerator (``--model sim:MS,US[,DIM]``)
                         that sleeps a device's time per batch and answers unit vectors
``tokenize``             the fast tokenizer stage (and the word-count stand-in of ``noop``)
``loader``               the one loader of serve, backfill and the benches: ``resolve_model``,
                         ``load_model``, ``load_runner`` (``--backend``, ``--quantize``, the gate)
``onnx_backend``         ``--backend onnx``: the export cache (:func:`ensure_onnx`) and
                         :class:`OrtNetwork`, an ORT session inside :class:`TorchBackend`
``quality``              the quality gate against torch fp32 (start-up and ``bench quality``)
``baselines``            plain transformers without kbatch: the benches' honest baselines
``errors``               the layer's error tree (``ModelError``), torch's OOM translated at the edge
=======================  ==========================================================================
"""
