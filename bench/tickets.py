"""The yes/no questions about one support ticket that bench/latency.py (its first eight) and
bench/multi_question.py (up to sixteen) ask; each keeps its own ticket text, whose length its results
were measured at."""

QUESTIONS = (
    "Does the customer report a duplicate charge?",
    "Is the customer asking for a refund?",
    "Does the customer threaten to cancel?",
    "Is there a problem with the mobile app?",
    "Is the customer angry or frustrated?",
    "Does the message mention a deadline?",
    "Has the customer contacted support before?",
    "Is the customer on a premium plan?",
    "Does the customer mention a chargeback or bank dispute?",
    "Is this a question about shipping?",
    "Does the customer praise the product?",
    "Is a password reset requested?",
    "Does the message mention an Android device?",
    "Is the amount charged more than $100?",
    "Should this ticket be escalated to a human?",
    "Is the message written in English?",
)
