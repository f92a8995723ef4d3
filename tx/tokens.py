"""The reserved token ids, the one place they live: model, search and data import them.

Every vocabulary tx trains reserves them (tx.data.tokenizer checks a SentencePiece model
against them):
  0 = <pad> (padding; masked everywhere), 1 = </s> (end of sentence),
  2 = <unk>, 3 = <s> (start token: the decoder input's first position).
"""

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
BOS_ID = 3
