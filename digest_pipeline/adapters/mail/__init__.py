"""Mail out: the mailers (outbox, SMTP, HTTP provider), MIME serialisation and the Jinja2 composer."""
