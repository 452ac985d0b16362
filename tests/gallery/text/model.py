import torch

VOCAB_SIZE = 16  # the lines of vocab.txt


class SentimentNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCAB_SIZE, 8, padding_idx=0)
        self.out = torch.nn.Linear(8, 2)

    def forward(self, ids):
        words = (ids != 0).unsqueeze(-1).float()
        mean = (self.embedding(ids) * words).sum(1) / words.sum(1).clamp(min=1)
        return self.out(mean)
