"""Handler sources the serving tests deploy (test helpers, not a test module)."""

#: A handler whose initialize fails at its line 6 (``for label in self.labels`` on None), after
#: noting each try in tries.txt (the replica runs in the model dir): one line means no restart.
BROKEN_CLASS = '''class Broken:
    def initialize(self, context):
        with open("tries.txt", "a") as f:  # the replica runs in the model dir
            f.write("try\\n")
        self.labels = None
        for label in self.labels:
            pass

    def handle(self, data, context):
        return data
'''
