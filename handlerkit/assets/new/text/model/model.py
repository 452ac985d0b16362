"""The model class. TorchServe builds it with no arguments, then loads model.pt into it; a
modelFile must define exactly one class."""

from torch import nn

VOCAB_SIZE = 64  # embedding rows: at least the lines of vocab.txt


class SentimentNet(nn.Module):
    """Token ids in (0 is padding), one score per class out: the mean of the tokens'
    embeddings, then a linear layer. Replace it with your own."""

    def __init__(self, vocab_size=VOCAB_SIZE, dim=8, num_classes=2):
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab_size, dim, mode="mean", padding_idx=0)
        self.classifier = nn.Linear(dim, num_classes)

    def forward(self, ids):
        return self.classifier(self.embedding(ids))
