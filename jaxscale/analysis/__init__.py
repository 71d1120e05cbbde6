"""What the compiler did: collective census, memory reports, TPU AOT."""
