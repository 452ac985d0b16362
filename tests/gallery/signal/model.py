import torch


class SoundEventNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 4, kernel_size=16, stride=8)
        self.out = torch.nn.Linear(4, 3)

    def forward(self, wave):
        features = torch.relu(self.conv(wave)).amax(dim=-1)  # [N, 4]: each filter's strongest response
        return self.out(features)
