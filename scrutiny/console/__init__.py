"""The operator's console, beside the auditor that serves it: `web` routes each request to `pages` (HTML from
`templates/`) or `api` (JSON), `asking` checks what a request asks for, `display` computes what is shown from plain
data (pure), `ledgerview`, `topicview` and `clusterview` gather a ledger's, a topic's and the cluster's facts."""
