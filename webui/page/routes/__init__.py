"""What the page's server answers beside Gradio: a shared chat's read-only page, the
Content-Security-Policy of every response, the sign-in page's notices, a signed-out tab."""
