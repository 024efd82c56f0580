"""Shared test data for the eval tests."""

QUESTIONS = [
    "What is 3+4?",
    "Tom has 12 apples and gives away 5. How many are left?",
    "A train travels 60 km per hour for 3 hours. How far does it go, in kilometres?",
    "Sum 1, 2 and 3.",
    "If a book costs $7 and a pen costs $2, what do 3 books and 4 pens cost together?",
    "Double 21.",
]
