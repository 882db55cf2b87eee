"""The retrieval app's parts, assembled by `searchrl.retrieval.serving.app.create_app`; nothing here is used
elsewhere."""

__all__: list[str] = []
