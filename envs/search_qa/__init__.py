"""Search-QA: answer questions by searching a corpus (``env``; the corpus, retrievers and the retrieval server)."""
