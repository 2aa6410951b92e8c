"""The server's routes for the APIs beyond OpenAI's, one module each: ``routes(server)``
gives its Starlette routes, run through ``APIServer``'s one engine and runner
(``answer``, ``call``, ``error``). Parsing and reply shapes live in ``wire/``."""
