"""The API's bodies as pydantic models: requests (chat completions and completions, the
Responses and Messages APIs), replies, and the one rule for request fields with each API's
table of what its fields do here."""
