"""HTTP/1.1 on both sides of the gateway: the lean server protocol (``server``) and its
uvicorn wiring (``uvicorn``), the upstream clients (``client``, the built-in keep-alive client;
``aiohttp_client``, the alternative) with their error tree (``errors``) and the rules for which
headers cross the hop (``headers``), and the raw ASGI helpers the edge and the pipeline share
(``asgi``)."""
