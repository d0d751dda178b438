"""The mixture-of-experts model of the voyage, its fused router kernel and its load balancing.

Importing this package imports torch; nothing outside steps/moe needs it to.
"""
