"""rfrs_ref.model"""
