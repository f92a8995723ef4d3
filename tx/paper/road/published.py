"""The published numbers the road experiments are printed beside (never computed here).

SEED: ../shared/seeds/road-to-the-transformer.txt ("The Road to the Transformer"), whose runs
used PyTorch on a laptop CPU. PAPER: Vaswani et al. (2017), Table 1.
"""

# Section 6 of the seed: exact-match (whole list right) and per-token accuracy on 500 new
# lists per length, teacher-forced; LSTM 16 -> 64 units, 2,500 steps of 64 lists of 3-12 digits.
DIGITS = {  # length: (no attention exact, tokens), (with attention exact, tokens), in %
    4: ((100.0, 100.0), (100.0, 100.0)),
    8: ((95.4, 99.5), (100.0, 100.0)),
    12: ((19.2, 89.3), (97.4, 99.8)),
    16: ((0.4, 72.7), (23.4, 91.3)),
}
DIGITS_WEIGHTS = {"no attention": 42_956, "with attention": 68_364}
DIGITS_TRAINING = "2,500 steps of 64 lists, lengths 3 to 12, teacher forcing"

# The seed's chart: |d h_T / d h_0| at T = 1 and T = 50, mean of 20 untrained networks, hidden 64.
GRADIENTS = {
    "tanh RNN": (4.0, 2e-16),  # "falls from about 4 to 2 x 10^-16"
    "LSTM": (None, 5e-11),  # "falls too, to about 5 x 10^-11"
    "LSTM, forget gate open (+3)": (2.0, 2.0),  # "keeps a signal of about 2 for all 50 steps"
}
# Its one-network check (section 3): average shrink per step of the tanh RNN.
TANH_SHRINK_PER_STEP = 0.440

# The paper's Table 1 (n length, d width, k kernel, r neighbourhood).
TABLE1 = {
    "self-attention": ("O(n^2 d)", "O(1)", "O(1)"),
    "recurrent": ("O(n d^2)", "O(n)", "O(n)"),
    "convolutional": ("O(k n d^2)", "O(1)", "O(log_k n)"),
    "restricted self-attention": ("O(r n d)", "O(1)", "O(n / r)"),
}
# The seed's timing: one LSTM layer vs one self-attention layer, d = 512, batch 32, n = 256,
# laptop CPU, forward only: LSTM step loop 121.6 ms, nn.LSTM 99.1 ms, self-attention 33.0 ms.
SEED_TIMING_MS = {"n": 256, "lstm_loop": 121.6, "nn.LSTM": 99.1, "self-attention": 33.0}
