"""`digest serve`: the small HTTP application that hears back from customers and the provider."""
