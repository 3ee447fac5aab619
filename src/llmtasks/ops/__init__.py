"""The operator's tools over one deployment (what `llmtasks stats`, `dlq`, `keys` and `streams`
run, and what the local console shows): they read and write the deployment's own tables and
queues through its AWS endpoint, the same against AWS or the local stack. They use the adapters'
item layouts and never the services: the service's behaviour is reached over its HTTP API."""
