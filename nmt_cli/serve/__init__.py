"""`nmt serve`: the process (app), the FastAPI application and its routes (routes), the
translation thread that batches requests (batcher), the bodies of requests and answers
(schemas), API keys and rate limits (access), guarded connections (connections), the language
pairs served (pairs), LibreTranslate's API (libretranslate), Prometheus metrics (metrics) and the
page to try it (page.html).

It imports the root's foundations, text/, model/ and decode/."""
