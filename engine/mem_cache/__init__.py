"""KV memory: request slots (``ReqToTokenPool``), token slots with their K/V buffers
(``TokenToKVPool``), and the radix prefix cache that shares them between requests."""
