"""WebShop: shop a catalog by searching and clicking (``env``; the generated catalog, the original data, the reward)."""
