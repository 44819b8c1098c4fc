"""The book's studies: each package measures one question with the system and judges the seed's claims.

``common`` is the scaffold every study shares (parameters, findings rows, the trained model family); ``sNN_*`` are
the studies, each with ``params`` (its profiles), measurement modules, ``verdicts`` and ``plots``. Nothing outside
this package imports it.
"""
