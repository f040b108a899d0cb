-- Page views per user (the topic's key), recomputed from the streaming table on every run.
CREATE MATERIALIZED VIEW views_per_user AS
SELECT user, count(*) AS views FROM page_views GROUP BY user
