"""The sampling features on the OpenAI API: their request fields (``sampling_fields``),
which engine kinds serve them (``sampling_support``), the response bodies with logprobs
and several choices (``response_format``, ``logprobs_format``), and ``n``, ``best_of``,
prompt lists and ``echo`` served as sibling requests (``choice_routes``)."""
