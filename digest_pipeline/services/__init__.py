"""Use cases over the domain and the ports; nothing here imports Dagster, SQLAlchemy or mail code."""
