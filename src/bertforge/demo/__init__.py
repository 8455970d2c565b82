"""``bertforge demo``: the end-to-end demo on a corpus it writes itself (:mod:`.corpus`: stories and sentiment
sentences from a fixed grammar), no data needed (:mod:`.run`)."""
