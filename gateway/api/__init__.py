"""The HTTP edge: routes (the proxied OpenAI endpoints, models, files, batches, usage, admin,
health, the OpenAPI document) that read what the client sent and answer in its API's shape.
The rules of a request are the pipeline's and its stages'; nothing here knows Redis or pools."""
