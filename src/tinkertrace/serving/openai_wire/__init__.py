"""The OpenAI wire format, written once for the sampling endpoint and the test server.

- :mod:`.errors`: :class:`~.errors.ApiError` (OpenAI's ``{"error": {...}}`` body), field checks,
  reading a JSON body.
- :mod:`.requests` and :mod:`.tools`: ``/v1/chat/completions`` and ``/v1/completions`` bodies
  validated into frozen dataclasses; function tools and ``tool_choice``.
- :mod:`.completions`: ``chat.completion``, ``chat.completion.chunk``, ``text_completion`` and
  ``/v1/models`` objects built from decoded :class:`~.completions.Choice` objects, with the vLLM
  token-id extension (``prompt_token_ids``, ``choices[].token_ids``).
- :mod:`.responses` and :mod:`.responses_stream`: the Responses API (``/v1/responses``): request,
  Response object, stream events.
- :mod:`.sse`: server-sent event framing.

Streams are built from the same choices as whole answers: a ``split`` function cuts a choice into
the pieces sent one per chunk (the endpoint sends a whole sample at once; the test server cuts
text into small pieces, as vLLM streams token by token).
"""
