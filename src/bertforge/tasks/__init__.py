"""Fine-tuning tasks: sentence (pair) classification and SQuAD v1.1 extractive question answering."""
