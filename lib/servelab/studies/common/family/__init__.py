"""A family of small language models trained offline on installed Python source (Studies 3 and 6).

``corpus`` reads and splits the source, ``tokenizer`` trains the BPE, ``recipe`` says what each model is,
``data`` cuts the token stream into windows, ``loop`` trains one model within a wall-time budget, ``cache`` keeps
a trained family on disk, and ``train.train_family`` runs them in that order.
"""
