"""Decoding (greedy and beam search) and scoring (tokenized BLEU and sacreBLEU)."""
