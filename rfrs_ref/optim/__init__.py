"""rfrs_ref.optim"""
