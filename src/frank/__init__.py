"""frank: declarative build-and-deploy for LLM engine variants."""
