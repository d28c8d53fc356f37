-- KEYS: the request's seen mark, the day's hash for key × model, the day's index, then the spend hashes.
-- ARGV: mark ttl s, index member, team, key prefix, retention s, cost, tokens, then field, value pairs.
-- Counts a request once whatever the retries: returns 0 when its id was seen already.
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return 0 end
local retention = tonumber(ARGV[5])
local i = 8
while ARGV[i] do
  redis.call('HINCRBYFLOAT', KEYS[2], ARGV[i], ARGV[i + 1])
  i = i + 2
end
redis.call('HSET', KEYS[2], 'team', ARGV[3], 'key_prefix', ARGV[4])
redis.call('EXPIRE', KEYS[2], retention)
redis.call('SADD', KEYS[3], ARGV[2])
redis.call('EXPIRE', KEYS[3], retention)
for k = 4, #KEYS do
  redis.call('HINCRBYFLOAT', KEYS[k], 'cost', ARGV[6])
  redis.call('HINCRBYFLOAT', KEYS[k], 'tokens', ARGV[7])
  redis.call('EXPIRE', KEYS[k], 40 * 86400)
end
return 1
