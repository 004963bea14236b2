"""rfrs_ref.attack"""
