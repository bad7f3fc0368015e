"""The mutating admission webhook: pods that ask for GPUs the way HAMi users write it
(``nvidia.com/gpu``, ``gpumem``, ``gpumem-percentage``, ``gpucores`` and the use/nouse annotations)
are rewritten to reference a ResourceClaimTemplate of the Tessera driver, and requests that can
never be met are refused at admission with one sentence saying why.

Layers, lowest first: ``review`` (shapes), ``selectors``, ``conversion``, ``fleet``/``validation``,
``mutation``, ``admission`` (pure decision for one review), then ``templates``, ``slices``,
``tls``, ``metrics``, ``server`` and ``cli`` (I/O). Nothing here imports the test bed.
"""
