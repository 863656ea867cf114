"""What the user writes: ``TaskModule`` and its hooks, the Lightning members, wrapping a plain ``nn.Module``,
``self.log`` results and manual optimization."""
