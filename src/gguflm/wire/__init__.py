"""Wire formats: each API's request bodies read into what to run and a ``GenerationSpec``
(``engine/spec.py``); its replies are shaped by ``replies.py``. One module per API."""
